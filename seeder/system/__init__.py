"""The machine: files and URIs, atomic writes and manifests, progress, threads and memory."""
