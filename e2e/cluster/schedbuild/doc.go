//go:build tools

// Package schedbuild pins a newer kube-scheduler than the cluster's (see bench/newer_scheduler.py):
// the fleet benchmark swaps it in to measure a newer release's DRA allocator on the same fleet.
// It has no code of its own: the binary is built with `go build k8s.io/kubernetes/cmd/kube-scheduler`.
package schedbuild

import _ "k8s.io/kubernetes/cmd/kube-scheduler"
