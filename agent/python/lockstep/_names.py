"""How recorded tensors are named (docs/python.md "Names").

A module's output is named after the module's path in ``named_modules()`` (the root
module is ``<root>``). Inside one micro step, the k-th call (k >= 1) of the same module
gets ``#k`` appended; elements of tuple/list outputs get ``[i]``, of dict outputs
(a transformers ``ModelOutput`` is one) ``[key]``, fields of namedtuple outputs
``.field`` (``heads.logits``), fields of other dataclass outputs ``[field]``, nested as
deep as ``_MAX_DEPTH``. Brackets and ``#`` never occur in module paths, so a suffixed
name can never collide with a child module's name (``layers.0`` is a child,
``layers[0]`` an output element); a namedtuple field named like a child module of the
same module (``heads.logits`` both) is written ``heads[logits]`` instead.

What a module received (kind ``act_in``, ``input_names``): one floating-point tensor
is named like the module (``fc1``); several are named by where they were passed, in
parentheses, so that an input never takes an output element's name: positional
``attn(0)``, ``attn(1)``, keyword ``attn(key_padding_mask)``, an element of a tuple or
list argument ``attn(position_embeddings)[0]`` (``attn#1(0)`` for a second call).
Parentheses never occur in module paths either. (Run logs written before this named
them ``attn[0]``, ``attn[1]``, ... in order, keywords last; the collector reads both.)

Each name also carries the type of the module it belongs to (``module_type_of``: the
output's module, the parameter's owner), sent in the tensor directory
(TensorInfo.module_type), so a message can say ``features.0 (Conv2d)``.
"""
import dataclasses
import re

import torch

ROOT_NAME = "<root>"
_MAX_DEPTH = 4


def module_name(path):
    return path if path else ROOT_NAME


def call_name(base, call_index):
    return base if call_index == 0 else "%s#%d" % (base, call_index)


def output_tensors(output, name, out, depth=0, paths=()):
    """Appends (name, tensor) for every tensor in ``output`` to ``out``; ignores
    anything that is not a tensor, list, tuple or dict. ``paths``: the module paths
    (a namedtuple field must not take a child module's name)."""
    if isinstance(output, torch.Tensor):
        out.append((name, output))
    elif depth >= _MAX_DEPTH:
        return
    elif isinstance(output, (tuple, list)):
        fields = getattr(output, "_fields", None)
        if isinstance(output, tuple) and fields and len(fields) == len(output):
            for field, item in zip(fields, output):
                child = "%s.%s" % (name, field)
                if child in paths:
                    child = "%s[%s]" % (name, field)
                output_tensors(item, child, out, depth + 1, paths)
            return
        for i, item in enumerate(output):
            output_tensors(item, "%s[%d]" % (name, i), out, depth + 1, paths)
    elif isinstance(output, dict):
        for key, item in output.items():
            output_tensors(item, "%s[%s]" % (name, key), out, depth + 1, paths)
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        for field in dataclasses.fields(output):
            output_tensors(getattr(output, field.name, None), "%s[%s]" % (name, field.name),
                           out, depth + 1, paths)


def input_names(base, args, kwargs):
    """(name, tensor) for each floating-point tensor a module received (kind act_in):
    just ``base`` when there is one, else ``base(i)`` for positional argument i,
    ``base(key)`` for keyword ``key``, ``base(i)[j]`` for element j of a tuple or list
    argument (the module docstring)."""
    if not kwargs and len(args) == 1 and isinstance(args[0], torch.Tensor):  # the usual call
        return [(base, args[0])] if args[0].is_floating_point() else []
    items = []
    for label, value in list(enumerate(args)) + (list(kwargs.items()) if kwargs else []):
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                items.append(("%s(%s)" % (base, label), value))
        elif isinstance(value, (tuple, list)):  # e.g. (cos, sin), or one tuple of tensors
            items.extend(("%s(%s)[%d]" % (base, label, j), x) for j, x in enumerate(value)
                         if isinstance(x, torch.Tensor) and x.is_floating_point())
    if len(items) == 1:
        return [(base, items[0][1])]
    return items


def module_type_of(name, types):
    """The type name of the module `name` belongs to ("" if none): the module whose
    output it is (call and element suffixes dropped), else the nearest enclosing module
    path (a parameter ``features.0.weight`` -> ``features.0``'s, a namedtuple field
    ``heads.logits`` -> ``heads``'s, an input ``attn(0)`` -> ``attn``'s). ``types``:
    module name -> type name."""
    base = name.split("#", 1)[0].split("[", 1)[0].split("(", 1)[0]
    while base:
        found = types.get(base)
        if found is not None:
            return found
        cut = base.rfind(".")
        if cut < 0:
            break
        base = base[:cut]
    return ""


class NameFilter:
    """include / exclude regular expressions (``re.search``) on module and parameter
    names. A bad pattern raises ValueError naming it (at watch() time)."""

    def __init__(self, include=None, exclude=None):
        self.include = self._compile(include, "include")
        self.exclude = self._compile(exclude, "exclude")

    @staticmethod
    def _compile(pattern, what):
        if pattern is None or pattern == "":
            return None
        try:
            return re.compile(pattern)
        except re.error as e:
            raise ValueError(
                "lockstep: the %s pattern %r is not a valid regular expression (%s); "
                "fix the pattern" % (what, pattern, e)) from None

    def __call__(self, name):
        if self.include is not None and not self.include.search(name):
            return False
        if self.exclude is not None and self.exclude.search(name):
            return False
        return True
