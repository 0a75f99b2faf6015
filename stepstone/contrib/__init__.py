"""Optional integrations, each behind an extra (``pip install 'stepstone[...]'``);
importing ``stepstone`` imports none of them."""
