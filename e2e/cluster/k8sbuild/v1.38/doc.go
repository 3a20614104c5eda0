// Package k8sbuild pins one Kubernetes release (1.38.0-beta.0, a probe only) and the etcd it ships with, whose server
// binaries gpuplane's e2e harness builds (see e2e/cluster/build.py and e2e/cluster/releases.py).
// It has no code of its own: the binaries are built with `go build <pkg>` from the modules
// required in go.mod.
package k8sbuild
