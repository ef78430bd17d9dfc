// Linked with every object of one library and only the dependencies it declares
// (cmake/layers.cmake): if the library calls into anything it does not declare, a
// layer above it included, this does not link.
int main() { return 0; }
