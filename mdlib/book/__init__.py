"""The book tier: the notebooks' parameters and execution, the generated pages and the HTML build,
figures, tables, provenance records, the scorecard, benchmarks and the command line. Imports the
experiments and the library; needs the extra ``[book]``. Import the modules themselves
(``from mdlib.book import scorecard``)."""
