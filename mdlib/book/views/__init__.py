"""How each chapter's tables and sentences look: the views (``*_view``: a results table as the book shows
it) and the words (``*_text``, ``*_texts``: numbers in the chapter's prose) of the experiments' results,
one module per chapter's experiment: ``sentiment`` (chapter 04), ``vision`` (chapter 07) and
``step_size_guide`` (chapter 09), and ``step_grid``, the words chapters share on a step-size grid's choice. They live in the book tier, not in the modules that compute a run kind's
numbers, so an edit of a table's look or a sentence leaves every stored run's key as it is (a run's
key fingerprints the code of its kind's module and of what that imports: ``mdlib.runs.identity``).
Import the modules' functions (``from mdlib.book.views.sentiment import table1_view``)."""
