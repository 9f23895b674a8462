/**
 * Log-probabilities an endpoint reports (issue 39, item 3; docs/decisions/audits.md): the
 * chat dialect's `choices[0].logprobs.content`, read from a JSON answer or from a stream's chunks,
 * checked, and scored. Used by the prober (the `logprobs` feature, src/adapters/upstream/) and
 * by the auditor's logprob test (runner.ts).
 *
 * What an endpoint says of its own probabilities is a claim, so it is checked where it can be:
 * - the tokens it scored must spell exactly the text it sent (bytes when it gives them), so
 *   the values are about the answer the client received;
 * - each value is a log-probability: finite and at most 0;
 * - at temperature 0 the token sent is the most probable one: no alternative it lists is more
 *   probable (by more than rounding);
 * - the alternatives' probabilities sum to at most 1.
 * An answer that asked for log-probabilities and fails any check scores `-Infinity`: the
 * statistics count it as the largest gap (tests.ts `LOGPROB_CLIP`), never as agreement.
 *
 * The score is the mean log-probability per token of the first {@link LOGPROB_TOKENS} tokens of a
 * temperature-0 answer. At temperature 0 the answer is the model's greedy continuation, so an
 * honest offer of the reference's model scores the same tokens as the reference (teacher forcing
 * along the greedy path) and its values differ only by kernel and quantization noise
 * (±0.07 nats/token); another model takes other tokens or gives them other values.
 */

/** Tokens of an answer the logprob score reads. */
export const LOGPROB_TOKENS = 8;

/** Rounding an endpoint's values may carry (float16/bfloat16 logits, printed decimals). */
const ROUNDING = 1e-3;

export interface TokenLogprob {
  readonly token: string;
  readonly logprob: number;
  readonly bytes?: readonly number[] | undefined;
  readonly top: readonly { readonly token: string; readonly logprob: number }[];
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** One `logprobs.content` entry, or undefined when it is not one. */
function entryOf(value: unknown): TokenLogprob | undefined {
  if (!isRecord(value) || typeof value["token"] !== "string") return undefined;
  const logprob = value["logprob"];
  if (typeof logprob !== "number") return undefined;
  const bytes = value["bytes"];
  const top = value["top_logprobs"];
  const alternatives: { token: string; logprob: number }[] = [];
  if (Array.isArray(top)) {
    for (const alt of top) {
      if (!isRecord(alt) || typeof alt["token"] !== "string" || typeof alt["logprob"] !== "number")
        return undefined;
      alternatives.push({ token: alt["token"], logprob: alt["logprob"] });
    }
  } else if (top !== undefined && top !== null) return undefined;
  return {
    token: value["token"],
    logprob,
    bytes:
      Array.isArray(bytes) && bytes.every((b) => Number.isInteger(b) && b >= 0 && b <= 255)
        ? (bytes as number[])
        : undefined,
    top: alternatives,
  };
}

/**
 * The log-probabilities of the first choice of a chat answer: a JSON completion or the chunks
 * of a stream, in order. `undefined`: the answer carries none (or one that is not the format).
 */
export function answerLogprobs(datas: readonly unknown[]): TokenLogprob[] | undefined {
  const out: TokenLogprob[] = [];
  let seen = false;
  for (const data of datas) {
    if (!isRecord(data) || !Array.isArray(data["choices"])) continue;
    for (const choice of data["choices"]) {
      if (!isRecord(choice) || (choice["index"] ?? 0) !== 0) continue;
      const logprobs = choice["logprobs"];
      if (logprobs === undefined || logprobs === null) continue;
      if (!isRecord(logprobs) || !Array.isArray(logprobs["content"])) return undefined;
      seen = true;
      for (const raw of logprobs["content"]) {
        const entry = entryOf(raw);
        if (entry === undefined) return undefined;
        out.push(entry);
      }
    }
  }
  return seen ? out : undefined;
}

const encoder = new TextEncoder();

function sameBytes(a: Uint8Array, b: readonly number[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function startsWith(whole: readonly number[], prefix: Uint8Array): boolean {
  return prefix.length <= whole.length && prefix.every((x, i) => x === whole[i]);
}

/**
 * Whether the scored tokens spell exactly `text` (by bytes when every entry gives them). With
 * `cut`, the text may end inside the last token: the gateway stops a stream where its own count
 * reaches the request's limit, which can fall inside a provider's chunk.
 */
function spells(entries: readonly TokenLogprob[], text: string, cut: boolean): boolean {
  const sent = encoder.encode(text);
  const bytesOf = (list: readonly TokenLogprob[]): number[] =>
    entries.every((e) => e.bytes !== undefined)
      ? list.flatMap((e) => e.bytes!)
      : [...encoder.encode(list.map((e) => e.token).join(""))];
  const all = bytesOf(entries);
  if (sameBytes(sent, all)) return true;
  if (!cut) return false;
  const before = bytesOf(entries.slice(0, -1));
  return (
    startsWith(all, sent) &&
    before.length < sent.length &&
    startsWith([...sent], new Uint8Array(before))
  );
}

/** Why an answer's log-probabilities cannot be believed; undefined: they pass every check. */
export function logprobFault(
  entries: readonly TokenLogprob[],
  text: string,
  greedy: boolean,
  cut = false,
): string | undefined {
  if (entries.length === 0) return text === "" ? undefined : "no token scored";
  if (!spells(entries, text, cut)) return "the scored tokens do not spell the answer";
  for (const [i, e] of entries.entries()) {
    const values = [e.logprob, ...e.top.map((t) => t.logprob)];
    if (values.some((v) => !Number.isFinite(v) || v > ROUNDING))
      return `token ${i}: a log-probability above 0 or not finite`;
    const mass = e.top.reduce((sum, t) => sum + Math.exp(t.logprob), 0);
    if (mass > 1 + ROUNDING) return `token ${i}: its alternatives' probabilities sum above 1`;
    if (greedy && e.top.some((t) => t.logprob > e.logprob + ROUNDING))
      return `token ${i}: at temperature 0 a more probable token was not sent`;
  }
  return undefined;
}

/**
 * The logprob test's score of a temperature-0 answer: the mean log-probability of its first
 * {@link LOGPROB_TOKENS} tokens, nats per token, and how many tokens it averaged (samples of
 * different lengths are different sequences). `-Infinity` when the values fail a check or were
 * asked for and not given. The answer is the one the gateway relayed: its text may end inside
 * the last token scored (a stream the gateway cut at the request's limit).
 */
export function logprobScore(
  entries: readonly TokenLogprob[] | undefined,
  text: string,
): { readonly mean: number; readonly tokens: number } {
  if (entries === undefined || logprobFault(entries, text, true, true) !== undefined)
    return { mean: Number.NEGATIVE_INFINITY, tokens: 0 };
  const first = entries.slice(0, LOGPROB_TOKENS);
  if (first.length === 0) return { mean: Number.NEGATIVE_INFINITY, tokens: 0 };
  const mean = first.reduce((sum, e) => sum + e.logprob, 0) / first.length;
  return { mean, tokens: first.length };
}
