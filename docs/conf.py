"""Sphinx configuration for mate's documentation (build: python -m sphinx -W -b html docs docs/_build/html)."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))
sys.path.insert(0, os.path.abspath("../wrappers/flashinfer"))

project = "mate"
author = "the mate developers"
copyright = "2026, the mate developers"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "developing.md"]
html_theme = "furo"
html_title = "mate"
napoleon_numpy_docstring = True
napoleon_google_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports = ["triton"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]
nitpicky = False
