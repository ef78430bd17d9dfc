// Linked with every object of qparams_client and nothing of the CLI, .npy or report
// targets (client/CMakeLists.txt): if the RPC client calls into a tool, this does
// not link.
int main() { return 0; }
