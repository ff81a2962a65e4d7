"""`vq`, the operator's command line: open, steer, watch and close a sale through the API's operator routes.

An operator tool, not Lambda code: nothing under chalicelib/ imports it and the deployment package leaves it
out. Installed as a console script by the project's install step (pyproject.toml, `make`). docs/operations.md
is its runbook.
"""
