"""One module per resource; each exposes ``build(state) -> APIRouter``."""
