// Package k8sbuild pins the Kubernetes and etcd releases whose server binaries
// gpuplane's e2e harness builds (see e2e/cluster/build.py). It has no code of its own:
// the binaries are built with `go build <pkg>` from the modules required in go.mod.
package k8sbuild
