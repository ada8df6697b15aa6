"""The check functions, one module per label. Each module's ``CASES`` lists its cases in catalogue order."""
