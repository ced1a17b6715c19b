"""CURVE key files for an authenticated, encrypted link to the collector
(docs/security.md). ``lockstep keygen NAME`` writes NAME.key (both keys, mode 0600)
and NAME.pub; both hold lines ``public-key = "<Z85>"`` / ``secret-key = "<Z85>"``.
"""
import os

_Z85 = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                 ".-:+=^!/*?&<>()[]{}@%$#")


def is_z85_key(text):
    return isinstance(text, str) and len(text) == 40 and all(c in _Z85 for c in text)


def read_key_file(path, what):
    """{'public-key': ..., 'secret-key': ...} from a keygen file; ValueError with one
    sentence naming the file (never the secret) on anything else."""
    try:
        with open(path, encoding="ascii") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError("lockstep: cannot read the %s file %r: %s" % (what, path, e)) from None
    keys = {}
    for no, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        name, value = name.strip(), value.strip().strip('"')
        if not sep or name not in ("public-key", "secret-key") or not is_z85_key(value):
            raise ValueError("lockstep: the %s file %r line %d is not a 'public-key = \"...\"' "
                             "or 'secret-key = \"...\"' line with a 40-character Z85 key"
                             % (what, path, no))
        keys[name] = value
    if "public-key" not in keys:
        raise ValueError("lockstep: the %s file %r holds no public-key" % (what, path))
    return keys


def resolve_curve(server_key, key_file):
    """(server public key, agent public key, agent secret key), all '' when CURVE is
    off. server_key: the collector's Z85 public key or its .pub/.key file; key_file:
    this agent's .key file, or None for a fresh key pair per run (enough when the
    collector admits any agent holding its public key)."""
    if not server_key:
        if key_file:
            raise ValueError("lockstep: curve_key (LOCKSTEP_CURVE_KEY) needs curve_server_key "
                             "(LOCKSTEP_CURVE_SERVER_KEY), the collector's public key")
        return "", "", ""
    if not is_z85_key(server_key):
        if not os.path.exists(server_key):
            raise ValueError("lockstep: curve_server_key is neither a 40-character Z85 key nor "
                             "an existing .pub file; give the collector's public key")
        server_key = read_key_file(server_key, "collector public key")["public-key"]
    if not key_file:
        return server_key, "", ""
    keys = read_key_file(key_file, "agent key")
    if "secret-key" not in keys:
        raise ValueError("lockstep: the agent key file %r has no secret-key; give the .key file "
                         "from 'lockstep keygen', not the .pub" % (key_file,))
    return server_key, keys["public-key"], keys["secret-key"]
