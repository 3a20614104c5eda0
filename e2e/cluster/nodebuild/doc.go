// Package nodebuild pins the containerd release whose binaries (containerd, ctr,
// containerd-shim-runc-v2) gpuplane's real e2e nodes run, and holds the pause program of
// their sandbox image (./pause). See e2e/cluster/realnode/binaries.py. The containerd binaries are
// built with `go build -tags no_btrfs <pkg>` from the module required in go.mod.
package nodebuild
