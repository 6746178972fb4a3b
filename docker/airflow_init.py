"""First-run set-up of Airflow in the deployment (the `airflow-init` service); safe to re-run.

1. `airflow db migrate` on the metadata database.
2. The admin's password into the simple auth manager's passwords file, from
   AIRFLOW_ADMIN_PASSWORD: the api-server would otherwise make one up and only print it.
   Other users in the file keep theirs; re-running with a new password changes the admin's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def admin_user(users_spec: str) -> str:
    """The first user with the admin role in `[core] simple_auth_manager_users`."""
    for entry in users_spec.split(","):
        fields = entry.strip().split(":")
        if len(fields) >= 2 and fields[1] == "admin":
            return fields[0]
    raise ValueError(f"no user with the admin role in simple_auth_manager_users={users_spec!r}")


def seed_password(path: Path, user: str, password: str) -> None:
    """Set `user`'s password in the JSON passwords file, written atomically with mode 0600."""
    if not password:
        raise ValueError("AIRFLOW_ADMIN_PASSWORD is empty")
    passwords = json.loads(path.read_text() or "{}") if path.exists() else {}
    if not isinstance(passwords, dict):
        raise ValueError(f"{path} is not a JSON object")
    passwords[user] = password
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(passwords, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def main() -> int:
    env = os.environ
    try:
        path = Path(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
        user = admin_user(env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin"))
        password = env.get("AIRFLOW_ADMIN_PASSWORD", "")
        if not password:
            raise ValueError("AIRFLOW_ADMIN_PASSWORD is empty")
    except (KeyError, ValueError) as e:
        print(f"airflow-init: missing setting: {e}", file=sys.stderr)
        return 2
    print("airflow-init: migrating the metadata database", file=sys.stderr)
    done = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=False)
    if done.returncode != 0:
        print(f"airflow-init: airflow db migrate exited {done.returncode}", file=sys.stderr)
        return done.returncode
    seed_password(path, user, password)
    print(f"airflow-init: password of {user!r} written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
