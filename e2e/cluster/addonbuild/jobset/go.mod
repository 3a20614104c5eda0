module gpuplane.dev/e2e/addonbuild/jobset

go 1.26.0

require sigs.k8s.io/jobset v0.12.0
