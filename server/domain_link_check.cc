// Linked with every object of the domain library and nothing of gRPC or the wire
// (server/CMakeLists.txt): if the domain calls into either, this does not link.
int main() { return 0; }
