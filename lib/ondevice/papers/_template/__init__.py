"""The new-paper skeleton: `make new-paper NAME=mypaper` copies it (see docs/adding-a-paper.md)."""
