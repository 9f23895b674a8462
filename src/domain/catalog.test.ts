import { describe, expect, it } from "vitest";
import { ModelDirectory } from "./catalog.js";

const modelId = `0x${"ab".repeat(32)}` as const;

describe("ModelDirectory", () => {
  const directory = new ModelDirectory([{ id: "demo-chat", modelId, aliases: ["chat"] }]);

  it("resolves public id, alias and ModelID in any hex case", () => {
    expect(directory.resolve("demo-chat")).toBe(modelId);
    expect(directory.resolve("chat")).toBe(modelId);
    expect(directory.resolve(modelId.toUpperCase().replace("0X", "0x"))).toBe(modelId);
    expect(directory.resolve("unknown")).toBeUndefined();
  });

  it("names uncatalogued models by their ModelID", () => {
    const other = `0x${"cd".repeat(32)}` as const;
    expect(directory.publicId(other)).toBe(other);
    expect(directory.publicId(modelId)).toBe("demo-chat");
    expect(directory.aliases(modelId)).toEqual(["chat"]);
  });

  it("refuses ambiguous catalogs", () => {
    expect(
      () =>
        new ModelDirectory([
          { id: "a", modelId, aliases: [] },
          { id: "b", modelId: `0x${"cd".repeat(32)}`, aliases: ["a"] },
        ]),
    ).toThrow(/used twice/);
  });
});
