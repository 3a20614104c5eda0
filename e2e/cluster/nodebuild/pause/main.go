// Command pause is the sandbox ("infra") container of gpuplane's real e2e nodes, packed as
// registry.k8s.io/pause:3.10 (e2e/cluster/realnode/images.py). It holds the pod's namespaces while
// doing nothing, reaps the zombies it inherits as a pod's PID 1, and exits 0 on SIGINT or
// SIGTERM. Built static (CGO_ENABLED=0) so the image needs no libc.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (gpuplane e2e) 3.10")
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "pause: warning: not running as PID 1")
	}
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
