"""The experiments tier: the results store, training runs through it, the data and the paper's
experiments. Imports the library (``mdlib``) and never the book (``mdlib.book``); needs the extra
``[experiments]``. Import the modules themselves (``from mdlib.experiments import sentiment``)."""
