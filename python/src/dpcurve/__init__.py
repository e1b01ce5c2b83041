"""dpcurve's Python client: differentially private curves from SQL, as pandas DataFrames.

    import dpcurve
    db = dpcurve.connect("grpc://127.0.0.1:31337", token=TOKEN)
    kde = db.curve("SELECT private_kde(x, 'auto', 0.5, 0) AS k FROM patients")
    dpcurve.plot(kde).savefig("kde.png")
"""

from ._client import Database, connect
from ._errors import (
    AuthenticationError,
    BudgetExhausted,
    Error,
    InvalidQuery,
    NoShare,
    Refused,
    ResultNotKept,
)
from ._frames import curve_frame
from ._plot import plot

__all__ = [
    "AuthenticationError",
    "BudgetExhausted",
    "Database",
    "Error",
    "InvalidQuery",
    "NoShare",
    "Refused",
    "ResultNotKept",
    "connect",
    "curve_frame",
    "plot",
]
__version__ = "0.1.0"
