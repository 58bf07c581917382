"""Code shared by the test modules (they import it as ``helpers``: pyproject.toml puts tests/ on pytest's
sys.path). Test modules never import one another or conftest.py: what two of them share lives here, and
conftest.py holds only fixtures and collection hooks."""
