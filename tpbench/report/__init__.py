"""The HTML report: built from the store's DataFrames and analysis outputs, never from raw traces."""

from tpbench.report.build import build_report, default_report_path, write_report

__all__ = ["build_report", "default_report_path", "write_report"]
