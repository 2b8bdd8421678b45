"""The article chain: fetch, extract, translate, score, polish or review, publish, write back.

Each step is a fenced keyed step on the article's ledger item (``article:<row key>``, see
:mod:`onceflow.ledger.steps`); its output is stored keyed by the row key, the processing version
and the step's fencing token, and its committed ledger result names that output. See
``docs/articles.md``.
"""
