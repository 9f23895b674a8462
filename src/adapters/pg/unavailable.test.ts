import { describe, expect, it } from "vitest";
import { isDatabaseUnavailable } from "./unavailable.js";

const withCode = (message: string, code: string) => Object.assign(new Error(message), { code });

describe("isDatabaseUnavailable", () => {
  it("recognises a database that cannot be asked", () => {
    for (const error of [
      withCode("connect ECONNREFUSED 127.0.0.1:5432", "ECONNREFUSED"),
      withCode("read ECONNRESET", "ECONNRESET"),
      withCode("terminating connection due to administrator command", "57P01"),
      withCode("the database system is starting up", "57P03"),
      withCode("sorry, too many clients already", "53300"),
      withCode("canceling statement due to statement timeout", "57014"),
      withCode("connection failure", "08006"),
      new Error("timeout exceeded when trying to connect"),
      new Error("Connection terminated unexpectedly"),
      new Error("Query read timeout"),
      new Error("wrapped", { cause: withCode("connect ECONNREFUSED", "ECONNREFUSED") }),
    ])
      expect(isDatabaseUnavailable(error), String(error)).toBe(true);
  });

  it("leaves other failures alone", () => {
    for (const error of [
      withCode('duplicate key value violates unique constraint "x"', "23505"),
      withCode('relation "x" does not exist', "42P01"),
      withCode("division by zero", "22012"),
      new Error("something else"),
      new TypeError("undefined is not a function"),
      "a string",
      undefined,
    ])
      expect(isDatabaseUnavailable(error), String(error)).toBe(false);
  });
});
