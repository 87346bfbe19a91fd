"""Stage `data`: datasets on disk. Synthetic JPEG datasets (`datasets`, make-dataset) and the
conversion of JPEG class folders into RecordIO, TFRecord and JPEG lists (`prepare`,
prepare-data).

May import `records` and `plan` (their errors); nothing but the cli and the runners' data
readers depend on it.
"""
