"""Models: heterogeneous client families (`families`), frozen text encoders (`text`) and
frozen image encoders (`image_encoders`, FMCL's foundation models)."""
