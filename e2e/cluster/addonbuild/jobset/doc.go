// Package jobset pins the JobSet release whose controller gpuplane's e2e harness builds and runs
// (see e2e/cluster/addons.py). It has no code of its own: the controller is built with
// `go build sigs.k8s.io/jobset` from the module required in go.mod.
package jobset
