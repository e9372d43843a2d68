"""The experiments tier: the data, training, the paper's experiments and their statistics (``mdlib.runs``,
how their runs are filed and scheduled, is of this tier too). Imports the library (``mdlib``) and never the book (``mdlib.book``); needs the extra
``[experiments]``. Import the modules themselves (``from mdlib.experiments import sentiment``)."""
