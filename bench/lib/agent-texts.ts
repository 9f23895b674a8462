import { seededRandom } from "../../src/domain/audits/random.js";

/**
 * The texts of `npm run bench:agent` (issue 35), all deterministic (seeded), so every run and
 * every tree sends the same bytes:
 *
 * - an agent's conversation of about 8,000 tokens (Qwen 3's count, chat template included): a
 *   long system prompt (rules and tool descriptions), six turns of history (a task, tool calls
 *   and their results: code, a test log, a diff) and a new last turn. The history is the same
 *   in every request, as an agent's next turn repeats it; only the last turn varies;
 * - the meter's hard answers: Chinese text without spaces (a CJK stream) and compact JSON; and
 *   English prose of about as many tokens, which the meter before issue 35 did count.
 */

const words = (
  "the a an of to in for on with by from as at is are was be been it this that these those " +
  "gateway request response provider model offer permit token count meter price charge stream " +
  "client server database record settle batch window limit budget claim usage tolerance " +
  "configure deploy verify measure profile cache worker queue retry timeout error status " +
  "should must may never always only each every when before after while until unless because " +
  "function module test file line change review commit branch build check lint format type " +
  "return value result input output answer question step plan task goal context history " +
  "fast slow exact bound long short first last next previous current new old same other"
).split(" ");

/** Prose of `n` words, in sentences, from the seeded generator. */
function prose(random: () => number, n: number): string {
  const out: string[] = [];
  let sentence: string[] = [];
  for (let i = 0; i < n; i++) {
    sentence.push(words[Math.floor(random() * words.length)]!);
    if (sentence.length >= 8 + Math.floor(random() * 12) || i === n - 1) {
      const s = sentence.join(" ");
      out.push(`${s[0]!.toUpperCase()}${s.slice(1)}.`);
      sentence = [];
    }
  }
  return out.join(" ");
}

/** A TypeScript-looking source file of `functions` functions. */
function code(random: () => number, functions: number): string {
  const lines: string[] = ['import { readFile } from "node:fs/promises";', ""];
  for (let f = 0; f < functions; f++) {
    const name = `${words[Math.floor(random() * words.length)]}${f}`;
    lines.push(
      `/** ${prose(random, 10)} */`,
      `export async function ${name}(input: string, limit = ${Math.floor(random() * 1000)}): Promise<number> {`,
      `  const text = await readFile(input, "utf8");`,
      `  let total = 0;`,
      `  for (const line of text.split("\\n")) {`,
      `    if (line.length > limit) throw new Error(\`line too long: \${line.length} > \${limit}\`);`,
      `    total += line.trim().length * ${1 + Math.floor(random() * 9)};`,
      `  }`,
      `  return total;`,
      `}`,
      "",
    );
  }
  return lines.join("\n");
}

/** A test runner's log of `n` results. */
function testLog(random: () => number, n: number): string {
  const lines: string[] = [];
  for (let i = 0; i < n; i++) {
    const ok = random() > 0.1;
    lines.push(
      `${ok ? " ✓" : " ✗"} src/${words[Math.floor(random() * words.length)]}/case-${i}.test.ts > ` +
        `${prose(random, 6).slice(0, -1).toLowerCase()} (${Math.floor(random() * 300)} ms)`,
    );
    if (!ok) {
      lines.push(
        `   AssertionError: expected ${Math.floor(random() * 100)} to equal ${Math.floor(random() * 100)}`,
      );
    }
  }
  return lines.join("\n");
}

const tools = ["read_file", "write_file", "run_command", "search_code", "list_directory"];

/** The system prompt: rules, then the tools' descriptions as JSON schemas. */
function systemPrompt(random: () => number): string {
  const rules = Array.from(
    { length: 45 },
    (_, i) => `${i + 1}. ${prose(random, 25 + Math.floor(random() * 20))}`,
  );
  const schemas = tools.map((name) =>
    JSON.stringify(
      {
        name,
        description: prose(random, 30),
        parameters: {
          type: "object",
          properties: {
            path: { type: "string", description: prose(random, 12) },
            content: { type: "string", description: prose(random, 10) },
            timeout_ms: { type: "integer", minimum: 1, maximum: 600000 },
          },
          required: ["path"],
        },
      },
      null,
      2,
    ),
  );
  return (
    `You are a coding agent working in a TypeScript repository. Follow these rules.\n\n` +
    `${rules.join("\n")}\n\n# Tools\n\n${schemas.join("\n\n")}\n\n` +
    `# Style\n\n${prose(random, 520)}`
  );
}

export interface AgentConversation {
  /** Everything but the last turn: the same in every request. */
  readonly prefix: readonly { role: string; content: string }[];
}

/** The agent's conversation (system prompt and six turns of history), the same every call. */
export function agentConversation(): AgentConversation {
  const random = seededRandom(35);
  const history = [
    { role: "system", content: systemPrompt(random) },
    {
      role: "user",
      content: `Task: ${prose(random, 120)}\n\nStart by reading src/meter/count.ts.`,
    },
    {
      role: "assistant",
      content: `${prose(random, 60)}\n\nCalling read_file with {"path":"src/meter/count.ts"}.`,
    },
    { role: "user", content: `Tool result (read_file):\n\n${code(random, 18)}` },
    {
      role: "assistant",
      content: `${prose(random, 90)}\n\nCalling run_command with {"command":"npm test"}.`,
    },
    { role: "user", content: `Tool result (run_command):\n\n${testLog(random, 60)}` },
    {
      role: "assistant",
      content: `${prose(random, 150)}\n\nProposed change:\n\n${code(random, 4)}`,
    },
  ];
  return { prefix: history };
}

/**
 * The `i`-th request's body: the fixed prefix and a new last user turn naming `i` (so no two
 * bodies are equal, as an agent's next turns are not).
 */
export function agentBody(
  conversation: AgentConversation,
  i: number,
  opts: { model: string; stream: boolean; maxTokens: number; user: string },
): string {
  const random = seededRandom(1000 + (i % 100_000));
  return JSON.stringify({
    model: opts.model,
    messages: [
      ...conversation.prefix,
      {
        role: "user",
        content: `Turn ${i}: ${prose(random, 40)} Then run the tests of module ${i % 97} again.`,
      },
    ],
    max_tokens: opts.maxTokens,
    user: opts.user,
    ...(opts.stream ? { stream: true } : {}),
  });
}

/** Chinese prose without a space (the fake upstream's CJK answer), `chunks` pieces of `size`. */
export function cjkChunks(chunks: number, size: number): string[] {
  const source =
    "网关会计量每一个响应服务提供方报告的用量只是一个声明由获得报酬的一方提出网关自己的计数才是测量结果" +
    "如果两者的差异超过容差付款人只需支付较低的那个数字东京的桜は三月の終わりから四月の初めにかけて満開" +
    "长江是中国最长的河流发源于青藏高原流经十一个省级行政区最后注入东海沿岸城市众多经济发达历史悠久";
  const random = seededRandom(7);
  const out: string[] = [];
  for (let c = 0; c < chunks; c++) {
    let piece = "";
    for (let k = 0; k < size; k++) piece += source[Math.floor(random() * source.length)]!;
    out.push(piece);
  }
  return out;
}

/** English prose (the text the meter has always counted), `chunks` pieces of `words` words. */
export function proseChunks(chunks: number, wordsEach: number): string[] {
  const random = seededRandom(13);
  return Array.from(
    { length: chunks },
    (_, i) => `${i === 0 ? "" : " "}${prose(random, wordsEach)}`,
  );
}

/** Compact JSON (no space anywhere) of about `bytes` bytes: the answer of a JSON-mode call. */
export function compactJson(bytes: number): string {
  const random = seededRandom(11);
  const items: unknown[] = [];
  let size = 2;
  while (size < bytes) {
    const item = {
      id: items.length,
      sku: `SKU-${Math.floor(random() * 1e8).toString(36)}`,
      price: Math.round(random() * 1e5) / 100,
      qty: Math.floor(random() * 50),
      tags: [
        words[Math.floor(random() * words.length)],
        words[Math.floor(random() * words.length)],
      ],
      ok: random() > 0.5,
    };
    size += JSON.stringify(item).length + 1;
    items.push(item);
  }
  return JSON.stringify({ items });
}
