"""Example processing functions referenced by the manifests in examples/."""
