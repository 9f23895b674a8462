import { describe, expect, it } from "vitest";
import { answerLogprobs, LOGPROB_TOKENS, logprobFault, logprobScore } from "./logprobs.js";

const utf8 = (s: string) => [...Buffer.from(s, "utf8")];

function entry(token: string, logprob: number, top: [string, number][] = []) {
  return {
    token,
    logprob,
    bytes: utf8(token),
    top_logprobs: top.map(([t, l]) => ({ token: t, logprob: l })),
  };
}

describe("answerLogprobs", () => {
  it("reads a JSON completion's first choice and a stream's chunks in order, and nothing else", () => {
    const json = {
      choices: [
        { index: 0, message: { content: "Hi there" }, logprobs: { content: [entry("Hi", -0.5)] } },
        { index: 1, message: { content: "x" }, logprobs: { content: [entry("x", -9)] } },
      ],
    };
    expect(answerLogprobs([json])?.map((e) => [e.token, e.logprob])).toEqual([["Hi", -0.5]]);
    const chunks = [
      { choices: [{ index: 0, delta: { role: "assistant", content: "" } }] },
      {
        choices: [{ index: 0, delta: { content: "Hi" }, logprobs: { content: [entry("Hi", -1)] } }],
      },
      {
        choices: [
          { index: 0, delta: { content: " there" }, logprobs: { content: [entry(" there", -2)] } },
        ],
      },
      { choices: [], usage: { prompt_tokens: 1 } },
    ];
    expect(answerLogprobs(chunks)?.map((e) => e.logprob)).toEqual([-1, -2]);
    // None asked or given, and a malformed one: not log-probabilities at all.
    expect(answerLogprobs([{ choices: [{ index: 0, message: { content: "Hi" } }] }])).toBe(
      undefined,
    );
    expect(
      answerLogprobs([{ choices: [{ index: 0, logprobs: { content: [{ token: "Hi" }] } }] }]),
    ).toBe(undefined);
  });
});

describe("logprobFault: what an endpoint claims of its probabilities is checked", () => {
  const read = (...entries: ReturnType<typeof entry>[]) =>
    answerLogprobs([{ choices: [{ index: 0, logprobs: { content: entries } }] }])!;

  it("passes values that spell the answer, are log-probabilities, and put the sent token first", () => {
    const ok = read(
      entry("Blue", -0.1, [
        ["Blue", -0.1],
        ["Red", -2.5],
      ]),
      entry(",", -0.01),
    );
    expect(logprobFault(ok, "Blue,", true)).toBe(undefined);
    // Multi-byte text split inside a character: the bytes spell it.
    const bytes = Buffer.from("海", "utf8");
    const split = answerLogprobs([
      {
        choices: [
          {
            index: 0,
            logprobs: {
              content: [
                { token: "\\xe6", logprob: -1, bytes: [bytes[0]], top_logprobs: [] },
                {
                  token: "\\xb5\\xb7",
                  logprob: -0.2,
                  bytes: [bytes[1], bytes[2]],
                  top_logprobs: [],
                },
              ],
            },
          },
        ],
      },
    ])!;
    expect(logprobFault(split, "海", true)).toBe(undefined);
  });

  it("refuses tokens that do not spell the text sent", () => {
    expect(logprobFault(read(entry("Red", -0.1)), "Blue", true)).toBe(
      "the scored tokens do not spell the answer",
    );
    expect(logprobFault(read(entry("Blue", -0.1)), "Blue and more", true)).toBe(
      "the scored tokens do not spell the answer",
    );
  });

  it("refuses values that are not log-probabilities, or alternatives summing above 1", () => {
    expect(logprobFault(read(entry("Hi", 0.5)), "Hi", true)).toBe(
      "token 0: a log-probability above 0 or not finite",
    );
    expect(
      logprobFault(
        read(
          entry("Hi", -0.1, [
            ["Hi", -0.1],
            ["Ho", -0.2],
          ]),
        ),
        "Hi",
        true,
      ),
    ).toBe("token 0: its alternatives' probabilities sum above 1");
  });

  it("at temperature 0, refuses a sent token less probable than an alternative it lists", () => {
    const lie = read(
      entry("Hi", -1.5, [
        ["Ho", -0.4],
        ["Hi", -1.5],
      ]),
    );
    expect(logprobFault(lie, "Hi", true)).toBe(
      "token 0: at temperature 0 a more probable token was not sent",
    );
    // Sampled (not greedy): a less probable token may be sent.
    expect(logprobFault(lie, "Hi", false)).toBe(undefined);
  });
});

describe("logprobScore", () => {
  it(`is the mean of the first ${LOGPROB_TOKENS} tokens, with how many it read`, () => {
    const tokens = Array.from({ length: 12 }, (_, i) => entry(`t${i}`, -(i + 1) / 8));
    const entries = answerLogprobs([{ choices: [{ index: 0, logprobs: { content: tokens } }] }]);
    const text = tokens.map((t) => t.token).join("");
    // -(1 + 2 + ... + 8) / 8 / 8 = -36 / 64
    expect(logprobScore(entries, text)).toEqual({ mean: -36 / 64, tokens: 8 });
    const short = answerLogprobs([
      { choices: [{ index: 0, logprobs: { content: tokens.slice(0, 3) } }] },
    ]);
    expect(logprobScore(short, "t0t1t2")).toEqual({ mean: -6 / 8 / 3, tokens: 3 });
  });

  it("reads a stream the gateway cut inside the last token, and nothing else cut", () => {
    const tokens = [entry("Hi", -0.5), entry(" there", -1.5)];
    const entries = answerLogprobs([{ choices: [{ index: 0, logprobs: { content: tokens } }] }]);
    expect(logprobScore(entries, "Hi th")).toEqual({ mean: -1, tokens: 2 });
    // Strictly (the prober's check), a cut text is not what the tokens spell.
    expect(logprobFault(entries!, "Hi th", true)).toBe("the scored tokens do not spell the answer");
    // A cut before the last token, or text the tokens never spelled: a fault either way.
    expect(logprobScore(entries, "H").mean).toBe(Number.NEGATIVE_INFINITY);
    expect(logprobScore(entries, "Hi thereafter").mean).toBe(Number.NEGATIVE_INFINITY);
  });

  it("is -Infinity for values asked for and not given, or failing a check", () => {
    expect(logprobScore(undefined, "Hi")).toEqual({ mean: Number.NEGATIVE_INFINITY, tokens: 0 });
    const wrong = answerLogprobs([
      { choices: [{ index: 0, logprobs: { content: [entry("Ho", -1)] } }] },
    ]);
    expect(logprobScore(wrong, "Hi")).toEqual({ mean: Number.NEGATIVE_INFINITY, tokens: 0 });
  });
});
