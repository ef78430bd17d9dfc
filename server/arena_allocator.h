// A gRPC message allocator that puts a unary call's request and response on one
// protobuf arena whose first block is part of the call's holder: a small request
// (a 64-float tensor, say) is parsed and answered with one allocation instead of one
// per message, string and repeated field.

#ifndef QPARAMS_SERVER_ARENA_ALLOCATOR_H_
#define QPARAMS_SERVER_ARENA_ALLOCATOR_H_

#include <cstddef>

#include "google/protobuf/arena.h"
#include "grpcpp/support/message_allocator.h"

namespace qparams {

template <typename Request, typename Response>
class ArenaMessageAllocator final : public grpc::MessageAllocator<Request, Response> {
 public:
  grpc::MessageHolder<Request, Response>* AllocateMessages() override { return new Holder(); }

 private:
  class Holder final : public grpc::MessageHolder<Request, Response> {
   public:
    Holder() : arena_(Options(initial_block_)) {
      this->set_request(google::protobuf::Arena::CreateMessage<Request>(&arena_));
      this->set_response(google::protobuf::Arena::CreateMessage<Response>(&arena_));
    }
    void Release() override { delete this; }

   private:
    // Room for a small request and its response; larger ones grow the arena.
    static constexpr size_t kInitialBlockBytes = 2048;

    static google::protobuf::ArenaOptions Options(char* block) {
      google::protobuf::ArenaOptions options;
      options.initial_block = block;
      options.initial_block_size = kInitialBlockBytes;
      return options;
    }

    alignas(std::max_align_t) char initial_block_[kInitialBlockBytes];
    google::protobuf::Arena arena_;  // after the block it starts in
  };
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_ARENA_ALLOCATOR_H_
