import { answerBridge } from "../../src/connect/chat-bridge.js";
import type { ChatEvent, ChatInput, Inference } from "../../src/domain/chat/index.js";
import { CheckedSink } from "./checked-sink.js";

/**
 * A chat call's events as an async generator, pulled as the RPC pulls them (the bridge of
 * src/connect/chat-bridge.ts over `Inference.chatInto`): for tests that read an answer event
 * by event. The call's pushes are checked against the sink contract's order on the way
 * ({@link CheckedSink}): a call that broke it ends the generator with that error.
 */
export function chatEvents(
  inference: Pick<Inference, "chatInto">,
  input: ChatInput,
): AsyncGenerator<ChatEvent, void, undefined> {
  return answerBridge(async (signal, sink) => {
    const checked = new CheckedSink(sink);
    try {
      await inference.chatInto({ ...input, signal }, checked);
    } finally {
      checked.check();
    }
  }, input.signal);
}
