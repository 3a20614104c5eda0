//go:build tools

// Package kwokbuild pins the KWOK release whose controller gpuplane's fleet benchmark
// builds (see e2e/cluster/kwok.py). It has no code of its own: the binary is built with
// `go build sigs.k8s.io/kwok/cmd/kwok` from the module required in go.mod, at the versions
// of its dependencies that go.mod and go.sum pin (KWOK v0.8.0 is built against the
// Kubernetes 1.36 client libraries).
package kwokbuild

import _ "sigs.k8s.io/kwok/cmd/kwok"
