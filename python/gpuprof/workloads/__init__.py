"""Workloads bundled with gpuprof (shown in profiles, unlike gpuprof's own code)."""
