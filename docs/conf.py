"""Sphinx configuration of the claw_rl_ros documentation (Markdown pages through MyST).

Build: ``make docs`` (``sphinx-build -W --keep-going -b html docs docs/_build/html``); rosdoc2
builds the same Sphinx project. The config reference pages are generated at build time from
the package's dataclasses by ``_ext/config_reference.py``.
"""

from pathlib import Path
import sys

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / '_ext'))
sys.path.insert(0, str(DOCS.parent))  # the package itself, also without an installed venv

project = 'claw_rl_ros'
author = 'claw_rl_ros developers'
copyright = 'claw_rl_ros developers'  # noqa: A001 - the name Sphinx reads

extensions = ['myst_parser', 'config_reference']
source_suffix = {'.md': 'markdown'}
root_doc = 'index'
exclude_patterns = ['_build', '_ext', '_scripts', 'Thumbs.db', '.DS_Store']

# GitHub-style anchors for headings down to ####, so `page.md#a-heading` links work on the
# site and on GitHub alike.
myst_heading_anchors = 4
myst_enable_extensions = ['colon_fence']

html_theme = 'alabaster'
html_title = 'claw_rl_ros'
html_theme_options = {'page_width': '1180px', 'sidebar_width': '230px'}
html_static_path = []
