"""Reports: the rows file (``rows``); rows -> tables (``tables``), plots (``plots``) and pages
(``pages``); claims judged against their intervals (``claims``)."""

from decodelab.report.claims import Verdict, across_seeds, verdict
from decodelab.report.pages import (Page, current_command, generic_report, other_cores,
                                    provenance_lines)
from decodelab.report.plots import line_plot
from decodelab.report.rows import ROWS_FILE, merge_rows, read_rows
from decodelab.report.tables import (MISSING, Table, format_value, load_rows, pivot_table,
                                     points_table, row_value, select, swept_keys, with_metrics)

__all__ = ["MISSING", "Page", "ROWS_FILE", "Table", "Verdict", "across_seeds", "current_command",
           "format_value", "generic_report", "line_plot", "load_rows", "merge_rows", "other_cores",
           "pivot_table", "points_table", "provenance_lines", "read_rows", "row_value", "select",
           "swept_keys", "verdict", "with_metrics"]
