"""The numbered SQL migrations, applied in order by `contentsvc migrate` and on start
(installed as the package data of `contentsvc.schema`)."""
