"""``python -m experiments.findings``: the report (:func:`experiments.findings.report.main`)."""

from experiments.findings.report import main

main()
