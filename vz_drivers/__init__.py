"""Built-in vz drivers, one package each."""
