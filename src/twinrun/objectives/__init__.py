"""Pure loss functions, one module per objective."""
