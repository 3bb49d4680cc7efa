"""Built-in engines. Heavy libraries are imported inside ``start()``, never here."""
