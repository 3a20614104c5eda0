"""Container images of gpuplane, built here from the project's own Dockerfiles.

No image can be pulled (no registry is reachable) and there is no Docker engine,
so the e2e suite builds what an operator would build with ``docker build``:

* :mod:`e2e.images.steps` runs a long external command with progress and a log;
* :mod:`e2e.images.buildah` wraps buildah (rootful, chroot isolation, its own
  storage in the cache), the builder from Debian's packages;
* :mod:`e2e.images.base` makes the offline Python base image: a Debian rootfs with
  Debian's python3 (mmdebstrap), packed as an image;
* :mod:`e2e.images.context` computes the cache key of an image: the hash of the
  Dockerfile, the files it copies from the build context, its build arguments and
  the base image id;
* :mod:`e2e.images.archive` names the images in an OCI archive for containerd;
* :mod:`e2e.images.build` builds ``Dockerfile.driver`` and ``Dockerfile.controller``
  on that base and exports each as an OCI archive (``python -m e2e images``).
* :mod:`e2e.images.previous` exports an earlier commit's tree from git and builds its own
  images the same way (version N-1 of the upgrade tests).
"""
