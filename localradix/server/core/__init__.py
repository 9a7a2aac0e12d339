"""The request core every API dialect shares.

A dialect decodes its body once (`body`), turns it into an OpenAI `ChatCompletionRequest` /
`CompletionRequest` (so validation, limits, sampling, grammar and tool parsing are computed once,
in `jobs`, `sampling` and `output`), runs the job (`gather` for a whole answer, `batches` for a
stream) and renders the outputs and errors in its own shape over the helpers in `http`.
"""
