"""Container images: names the build and the system configs share, the dependency lock, the build itself."""
