// placeholder: filled in by the work on issue 14
