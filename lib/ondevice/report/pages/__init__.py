"""The published pages: one content model per result (content), the words and numbers of its
cells (cells), and the Jinja2 templates that render it as Markdown and HTML (render, templates/).
`report.publish` assembles them into the site."""
