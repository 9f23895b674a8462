import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";
import { describe, expect, it } from "vitest";
import { checkTokenizerRegistry, findTokenizer, loadTokenizerRegistry } from "../registry.js";

/**
 * The embedded routes where one family's templates differ (issue 35, item 10): a model is
 * counted with its own template or, where the gateway ships none, metered by the byte bound
 * (no route), never with a sibling's template.
 */
describe("embedded routes of families whose templates differ", () => {
  const embedded = loadTokenizerRegistry();
  const nameOf = (repository: string, revision = "main") =>
    findTokenizer(embedded, { repository, revision })?.name;

  it("the embedded files hash to what the registry pins", async () => {
    await expect(checkTokenizerRegistry(embedded)).resolves.toBeUndefined();
  });

  it("counts Qwen3-Coder with its own template, never Qwen 3's", () => {
    for (const repository of [
      "Qwen/Qwen3-Coder-480B-A35B-Instruct",
      "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8",
      "Qwen/Qwen3-Coder-30B-A3B-Instruct",
      "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8",
    ]) {
      expect(nameOf(repository), repository).toBe("qwen3-coder");
    }
    // Other Coder releases (their templates are not shipped): bound, not Qwen 3's template.
    expect(nameOf("Qwen/Qwen3-Coder-Next")).toBeUndefined();
    // Qwen 3's own releases keep Qwen 3's.
    for (const repository of ["Qwen/Qwen3-8B", "Qwen/Qwen3-235B-A22B", "Qwen/Qwen3-30B-A3B-FP8"]) {
      expect(nameOf(repository), repository).toBe("qwen3");
    }
    // Siblings with templates of their own (2507 instruct, VL): no longer Qwen 3's by the glob.
    for (const repository of [
      "Qwen/Qwen3-235B-A22B-Instruct-2507",
      "Qwen/Qwen3-VL-8B-Instruct",
      "Qwen/Qwen3-Next-80B-A3B-Instruct",
    ]) {
      expect(nameOf(repository), repository).toBeUndefined();
    }
  });

  it("counts DeepSeek V3.1 with its own template, never V3's", () => {
    expect(nameOf("deepseek-ai/DeepSeek-V3.1")).toBe("deepseek-v3.1");
    expect(nameOf("deepseek-ai/DeepSeek-V3")).toBe("deepseek-v3");
    expect(nameOf("deepseek-ai/DeepSeek-V3-0324")).toBe("deepseek-v3");
    // Later releases whose templates are not shipped: bound.
    for (const repository of [
      "deepseek-ai/DeepSeek-V3.1-Terminus",
      "deepseek-ai/DeepSeek-V3.2-Exp",
      "deepseek-ai/DeepSeek-V3.2",
    ]) {
      expect(nameOf(repository), repository).toBeUndefined();
    }
  });

  it("meters Llama 3.2 Vision by the bound (its tokenizer and template are not shipped), never Llama 3.1's", () => {
    for (const repository of [
      "meta-llama/Llama-3.2-11B-Vision-Instruct",
      "meta-llama/Llama-3.2-90B-Vision-Instruct",
      "meta-llama/Llama-3.2-11B-Vision",
    ]) {
      expect(nameOf(repository), repository).toBeUndefined();
    }
    for (const repository of [
      "meta-llama/Llama-3.2-3B-Instruct",
      "meta-llama/Llama-3.2-1B-Instruct",
      "meta-llama/Llama-3.1-8B-Instruct",
      "meta-llama/Llama-3.3-70B-Instruct",
    ]) {
      expect(nameOf(repository), repository).toBe("llama3.1");
    }
  });

  it("renders the shipped templates as their models' servers do", () => {
    const render = (name: string, context: Record<string, unknown>) => {
      const entry = embedded.tokenizers.get(name)!;
      return new Template(readFileSync(entry.chatTemplate, "utf8")).render({
        add_generation_prompt: true,
        bos_token: "<｜begin▁of▁sentence｜>",
        ...context,
      });
    };
    const messages = [
      { role: "system", content: "Be brief." },
      { role: "user", content: "Hi" },
    ];
    expect(render("deepseek-v3.1", { messages })).toBe(
      "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>",
    );
    const tools = [
      {
        type: "function",
        function: {
          name: "get_weather",
          parameters: { type: "object", properties: { city: { type: "string" } } },
        },
      },
    ];
    const coder = render("qwen3-coder", { messages, tools });
    expect(coder).toContain(
      "<name>get_weather</name>\n<parameters>\n<parameter>\n<name>city</name>",
    );
    expect(
      coder.endsWith("<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
    ).toBe(true);
  });
});
