"""The prepared GPU check: ``OUT=DIR bash gpu/gpu_check.sh`` from the repository root (see gpu_check.sh).

Each part is a module run as ``python -m gpu.NAME`` in its own process; ``REHEARSE=1`` runs them on
CPU to test the check itself.
"""
