# Sphinx configuration of the vgpu-bridge documentation (make docs).
import os

project = "vgpu-bridge"
copyright = "vgpu-bridge authors, Apache License 2.0"
author = "vgpu-bridge authors"
release = open(os.path.join(os.path.dirname(__file__), "..", "..", "VERSION")).read().strip()
version = release
extensions = []
master_doc = "index"
exclude_patterns = []
html_theme = "alabaster"
highlight_language = "none"
