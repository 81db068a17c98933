"""Models: heterogeneous client families (`families`) and frozen text encoders (`text`)."""
