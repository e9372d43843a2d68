"""Load MathJax on every page of the book, not only on pages whose body has math: chapter titles with
math (chapter 1's $\\ell_p$) appear in every page's sidebar and would otherwise show as raw TeX."""


def setup(app):
    app.set_html_assets_policy("always")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
