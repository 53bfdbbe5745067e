"""The kubelet device plugin advertising ``gnnsched.io/gpu-share`` MPS client slots."""
