"""Reports: the rows file (``rows``); rows -> tables (``tables``), plots (``plots``) and pages
(``pages``); claims declared as data and judged against their intervals (``claims``); the one page
form and the results index (``form``)."""

from decodelab.report.rows import ROWS_FILE, merge_rows, read_rows
from decodelab.report.tables import (MISSING, Table, format_number, format_value, load_rows,
                                     parse_where, pivot_table, points_table, row_value, select,
                                     select_where, swept_keys, with_metrics)
from decodelab.report.plots import Axes, line_plot
from decodelab.report.claims import Claim, Judged, Verdict, across_seeds, on_row, verdict
from decodelab.report.pages import (Page, backend, current_command, generic_report,
                                    other_cores, provenance_lines)
from decodelab.report.form import Form, Rendered, render, tally, write_index

__all__ = ["Axes", "Claim", "Form", "Judged", "MISSING", "Page", "ROWS_FILE", "Rendered", "Table",
           "Verdict", "across_seeds", "backend", "current_command", "format_number", "format_value",
           "generic_report", "line_plot", "load_rows", "merge_rows", "on_row", "other_cores",
           "parse_where", "pivot_table", "points_table", "provenance_lines", "read_rows", "render",
           "row_value", "select", "select_where", "swept_keys", "tally", "verdict", "with_metrics",
           "write_index"]
