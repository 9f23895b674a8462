import { describe, expect, it } from "vitest";
import { words } from "../../../test/helpers/exact-counter.js";
import { OutputTally } from "./output-tally.js";

/**
 * A provider that generates past the request's limit is cut where the gateway's count reaches
 * it; its `logprobs` must be cut there too, or their tokens would hand the client the text cut
 * away (a JSON answer's list covers the whole answer).
 */

const entry = (token: string) => ({
  token,
  logprob: -0.25,
  bytes: [...Buffer.from(token, "utf8")],
  top_logprobs: [],
});
const tokens = (list: { token: string }[]) => list.map((e) => e.token);

describe("log-probabilities of a cut answer", () => {
  it("a JSON answer keeps the entries of the text it kept, none of the text cut away", () => {
    const tally = new OutputTally(words(), 3n, 1n);
    const content = [" a", " b", " c", " d", " e"];
    const body = {
      choices: [
        {
          index: 0,
          message: { role: "assistant", content: content.join("") },
          logprobs: { content: content.map(entry), refusal: null },
          finish_reason: "stop",
        },
      ],
    };
    expect(tally.addAnswer(body)).toBe(true);
    const choice = body.choices[0]!;
    expect(choice.message.content).toBe(" a b c");
    expect(tokens(choice.logprobs.content)).toEqual([" a", " b", " c"]);
    expect(choice.logprobs.refusal).toBeNull();
    expect(choice.finish_reason).toBe("length");
  });

  it("an entry the cut falls inside is kept (its text was partly sent), the ones after it are not", () => {
    // The provider's tokens hold two of the gateway's each: the limit of 3 falls inside " c d".
    const tally = new OutputTally(words(), 3n, 1n);
    const content = [" a b", " c d", " e f"];
    const body = {
      choices: [
        {
          index: 0,
          message: { role: "assistant", content: content.join("") },
          logprobs: { content: content.map(entry) },
          finish_reason: "stop",
        },
      ],
    };
    tally.addAnswer(body);
    expect(body.choices[0]!.message.content).toBe(" a b c");
    expect(tokens(body.choices[0]!.logprobs.content)).toEqual([" a b", " c d"]);
  });

  it("a stream's cut chunk carries the entries of its kept text; an uncut chunk is relayed as it came", () => {
    const tally = new OutputTally(words(), 3n, 1n);
    const first = {
      id: "c",
      choices: [
        {
          index: 0,
          delta: { content: " w0 w1" },
          logprobs: { content: [entry(" w0"), entry(" w1")] },
          finish_reason: null,
        },
      ],
    };
    expect(tally.addChunk(first)).toBe(first);
    const second = {
      id: "c",
      choices: [
        {
          index: 0,
          delta: { content: " w2 w3 w4" },
          logprobs: { content: [entry(" w2"), entry(" w3"), entry(" w4")] },
          finish_reason: null,
        },
      ],
    };
    expect(tally.addChunk(second)).toEqual({
      id: "c",
      choices: [
        {
          index: 0,
          delta: { content: " w2" },
          logprobs: { content: [entry(" w2")] },
          finish_reason: "length",
        },
      ],
    });
    // Entries without bytes are measured by their token's UTF-8.
    const tally2 = new OutputTally(words(), 1n, 1n);
    const out = tally2.addChunk({
      id: "c",
      choices: [
        {
          index: 0,
          delta: { content: " é ü" },
          logprobs: {
            content: [
              { token: " é", logprob: -1 },
              { token: " ü", logprob: -1 },
            ],
          },
          finish_reason: null,
        },
      ],
    }) as { choices: { logprobs: { content: { token: string }[] } }[] };
    expect(tokens(out.choices[0]!.logprobs.content)).toEqual([" é"]);
  });
});
